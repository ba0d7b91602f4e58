"""A replica's upload slots, as a key's costs (issue 33): a key holds at most its share of
them, a replica receives at most its cap at once, and a check whose client left gives its
slot back at once. Real gateway, broker and S3 API server; slow clients made here."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.fake_vllm import FakeVllm
from tests.jobs.archives import tar_of
from tests.jobs.costs import MiB, envelope, keys_with_limits, send_upload
from tests.jobstack import JobsStack, jobs_stack
from tests.waiting import eventually

BOMBS = Path(__file__).resolve().parents[1] / "data" / "bombs"


def test_a_check_stops_when_its_client_leaves_and_frees_its_slot(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """With the ratio bound off, a 3 KB bzip2 of 4 GiB of zeros takes the check 10-25 s of a
    core. The client gives up after a second; its check stops within about one
    disconnect poll, and the replica's only upload slot is free again long before the
    check would have ended on its own."""
    settings = {
        "max_concurrent_uploads": 1,
        "max_upload_ratio": 1e12,
        "max_upload_unpacked_bytes": 5 * 1024 * MiB,
        "upload_check_seconds": 600,
    }
    with jobs_stack(broker, s3, model, tmp_path, jobs=settings) as stack:
        url = f"{stack.base}/v1/jobs/workspaces"
        bomb = (BOMBS / "bz2-4g.tar.bz2").read_bytes()
        gave_up: list[bool] = []

        def leaving_client() -> None:
            # Sent again while a probe below holds the slot (503), until its check runs.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    resp = httpx.post(url, content=bomb, timeout=httpx.Timeout(10, read=2.0))
                except httpx.ReadTimeout:
                    gave_up.append(True)
                    return
                assert resp.status_code == 503, resp.text

        client = threading.Thread(target=leaving_client)
        client.start()
        small = tar_of({"f": b"x"}, mode="w:gz")
        # The premise: the bomb's check holds the replica's only slot.
        seen: list[str] = []

        def held() -> bool:
            resp = send_upload(stack, small, {})
            seen.append(f"{resp.status_code} {resp.text[:200]}")
            return resp.status_code == 503

        eventually(held, 10, 0.3, lambda: f"the slot to be held: {seen[-3:]}")
        client.join(30)
        assert gave_up == [True]
        eventually(
            lambda: send_upload(stack, small, {}).status_code == 200,
            2.5,
            0.1,
            "the upload slot was not freed after the client left",
        )


class SlowUploads:
    """Slow uploads (4 MiB, a piece every 0.2 s until released: in the gateway's hands,
    spooling, all along, as a slow client's are) from one key, held until :meth:`release`."""

    def __init__(self, stack: JobsStack, headers: dict[str, str], pool: ThreadPoolExecutor):
        self._url = f"{stack.base}/v1/jobs/workspaces"
        self._headers = headers
        self._pool = pool
        self._released = threading.Event()
        self._body = tar_of({"f": bytes(4 * MiB)})
        self.sent: list[Future[tuple[int, str]]] = []

    def _pieces(self) -> Iterator[bytes]:
        for start in range(0, len(self._body), 64 * 1024):
            if not self._released.is_set():
                self._released.wait(0.2)
            yield self._body[start : start + 64 * 1024]

    def _send(self) -> tuple[int, str]:
        resp = httpx.post(self._url, content=self._pieces(), headers=self._headers, timeout=60)
        return resp.status_code, resp.text[:300]

    def send(self, count: int = 1) -> None:
        for _ in range(count):
            self.sent.append(self._pool.submit(self._send))

    def release(self) -> list[int]:
        """Let them finish; their statuses, sorted."""
        self._released.set()
        return sorted(f.result()[0] for f in self.sent)


def _refused_while_held(
    stack: JobsStack,
    slow: SlowUploads,
    probe: dict[str, str],
    status: int,
    code: str,
) -> dict[str, Any]:
    """Probe uploads (``probe``'s key) until one is refused ``status``; its error. A probe
    that gets through held a slot at the moment a slow upload arrived, which was refused
    then (its answer waits for its slow body): one more slow upload goes out each time."""
    small = tar_of({"f": b"x"}, mode="w:gz")
    seen: list[int] = []

    def refused() -> bool:
        seen.append(send_upload(stack, small, probe).status_code)
        if seen[-1] != status and len(slow.sent) < 8:
            slow.send()
        return seen[-1] == status

    eventually(refused, 10, 0.2, lambda: f"an upload refused {status}: {seen[-5:]}")
    return envelope(send_upload(stack, small, probe), status, code)


def test_one_key_holds_at_most_its_share_of_a_replicas_upload_slots(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Eight slow uploads from one key took every slot of a replica: its others' got 503
    upload_capacity for as long. A key now holds jobs.max_concurrent_uploads_per_key (2)."""
    auth, h = keys_with_limits("a", "b")
    with jobs_stack(broker, s3, model, tmp_path, auth=auth) as stack, ThreadPoolExecutor(8) as pool:
        slow = SlowUploads(stack, h["a"], pool)
        slow.send(2)
        try:
            error = _refused_while_held(stack, slow, h["a"], 429, "too_many_concurrent_uploads")
            assert "jobs.max_concurrent_uploads_per_key: 2" in error["message"]
            small = tar_of({"f": b"x"}, mode="w:gz")
            assert send_upload(stack, small, h["b"]).status_code == 200  # the neighbour's
        finally:
            codes = slow.release()
        # Two were received (the key's two slots); any other was refused, none failed.
        assert codes == [200, 200] + [429] * (len(codes) - 2), codes


def test_a_replica_receives_at_most_its_uploads_at_once(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """The README's jobs.max_concurrent_uploads: a replica receiving as many as it takes
    answers the next, whoever sends it, 503 upload_capacity, and takes
    uploads again once they end."""
    auth, h = keys_with_limits("a", "b")
    jobs = {"max_concurrent_uploads": 2}
    with (
        jobs_stack(broker, s3, model, tmp_path, auth=auth, jobs=jobs) as stack,
        ThreadPoolExecutor(8) as pool,
    ):
        slow = SlowUploads(stack, h["a"], pool)
        slow.send(2)
        try:
            error = _refused_while_held(stack, slow, h["b"], 503, "upload_capacity")
            assert "jobs.max_concurrent_uploads" in error["message"], error
        finally:
            codes = slow.release()
        assert codes == [200, 200] + [503] * (len(codes) - 2), codes
        assert send_upload(stack, tar_of({"f": b"x"}, mode="w:gz"), h["b"]).status_code == 200
