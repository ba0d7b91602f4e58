"""What a job's owner is told when the job fails, and what only the worker's log keeps.

A job's error (``job.error.message``, the ``job.failed`` event, a retry's reason) is read by
the tenant, who may be hostile: it must name nothing of the installation. Exception texts
from below (botocore, the OS, httpx, tarfile) carry endpoints, buckets, object keys and the
worker's own paths, so they are never passed on whole: an error the job itself caused (its
workspace, its limits, its model's answers) keeps its message with every worker path and
URL taken out, and anything else becomes a fixed sentence that points at the worker's log,
where the detail is written under the job's id.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("tiergate.worker")

# A URL, or an absolute path outside what the job itself sees (/workspace, its /tmp).
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>)]+")
_PATH = re.compile(r"(?<![\w.~-])/(?!workspace\b|tmp\b)[^\s'\",:;)\]}]+")
_MAX = 500


def scrub(text: str) -> str:
    """``text`` without URLs or worker paths, cut to a length an error field holds."""
    text = _URL.sub("<url>", text)
    text = _PATH.sub("<worker path>", text)
    return text if len(text) <= _MAX else text[: _MAX - 3] + "..."


def internal(job_id: str, exc: BaseException) -> str:
    """The owner's message for a failure of the worker itself; the detail goes to the log."""
    log.error("job %s failed in the worker", job_id, exc_info=exc)
    return (
        "the worker failed while running this job (an internal error); the operator's "
        f"worker log has the detail under job {job_id}"
    )


def transient(job_id: str, exc: BaseException, what: str) -> str:
    """The owner's message for a dependency that failed (object storage, the model
    endpoint): ``what`` names it; the exception's text goes to the log only."""
    log.warning("job %s: %s failed: %s", job_id, what, exc)
    return f"{what} was unavailable"
