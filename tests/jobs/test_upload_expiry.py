"""The README's clean-up of expired uploads: an upload past its time to live, plus the grace
in which a job accepted just before its expiry may still read it, is deleted by its key's
next upload, which is kept, as is a fresh one and every other key's. Real gateway and S3
(SeaweedFS)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.fakes.fake_vllm import FakeVllm
from tests.jobs.archives import tar_of
from tests.jobs.tenants import tenants
from tests.jobstack import jobs_stack
from tests.waiting import eventually
from tiergate.jobs.state.store import JobStore

# A time to live of 1 s; the grace is 2 x requeue_after_seconds + max_attempts x the jobs'
# timeout cap: 2 x 0.5 + 1 x 1 = 2 s. An upload goes on its key's next upload 3 s old.
JOBS = {"upload_ttl_seconds": 1, "requeue_after_seconds": 0.5, "caps": {"timeout_seconds": 1}}


def test_an_expired_upload_is_deleted_by_the_keys_next_upload_after_its_grace(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    keys = tenants("a", "b")
    a, owner = keys.headers("a"), keys.owners["a"]
    with jobs_stack(
        broker, s3, model, tmp_path, auth=keys.auth, jobs=JOBS, worker={"max_attempts": 1}
    ) as stack:
        store = JobStore(stack.jobs.storage)
        url = f"{stack.base}/v1/jobs/workspaces"

        def upload(headers: dict[str, str]) -> str:
            resp = httpx.post(url, content=tar_of({"f": b"x"}), headers=headers)
            assert resp.status_code == 200, resp.text
            return str(resp.json()["id"])

        def stored() -> set[str]:
            return {name for name, _, _ in store.uploads(owner)}

        first = upload(a)
        theirs = upload(keys.headers("b"))
        second = upload(a)  # the first is a moment old: kept
        assert {first, second} <= stored()
        last: list[str] = []

        def deleted() -> bool:
            last.append(upload(a))
            return first not in stored()

        eventually(deleted, 30, 1.0, "the expired upload deleted by a later upload")
        assert last[-1] in stored()  # the upload that deleted it is kept
        # Another key's uploads are its own business: nothing of b's was touched.
        assert theirs in {name for name, _, _ in store.uploads(keys.owners["b"])}
