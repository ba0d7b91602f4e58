"""What a job's owner is told of a failure names nothing of the installation."""

from __future__ import annotations

import logging

import pytest

from tiergate.jobs.state import joberrors


def test_scrub_takes_out_urls_and_worker_paths_but_keeps_the_jobs_own() -> None:
    text = (
        "cannot make the workspace under /var/lib/tiergate/jobs/job_1: [Errno 28] No space; "
        "could not reach http://minio.internal:9000/tiergate-jobs/uploads/alice/upl_1.tar; "
        "'/workspace/out.txt' is outside; /tmp/x"
    )
    said = joberrors.scrub(text)
    for internal in ("/var/lib", "minio.internal", "tiergate-jobs", "uploads/alice"):
        assert internal not in said, said
    assert "/workspace/out.txt" in said and "/tmp/x" in said and "No space" in said
    assert len(joberrors.scrub("x" * 10_000)) == 500


def test_an_internal_error_is_a_fixed_sentence_and_the_detail_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exc = KeyError("s3://tiergate-jobs/jobs/job_1/state.json")
    with caplog.at_level(logging.ERROR, logger="tiergate.worker"):
        said = joberrors.internal("job_1", exc)
    assert "tiergate-jobs" not in said and "KeyError" not in said and "job_1" in said
    assert "job_1" in caplog.text and "tiergate-jobs" in caplog.text


def test_a_dependency_failure_names_the_dependency_only() -> None:
    exc = RuntimeError("EndpointConnectionError: http://10.0.0.5:9000/bucket")
    assert joberrors.transient("job_1", exc, "object storage") == ("object storage was unavailable")
