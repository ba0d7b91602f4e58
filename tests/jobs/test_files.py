"""OpenAI's Files API as the official ``openai`` client calls it, through a real gateway with
a real S3 API server (SeaweedFS) behind it: upload, retrieve, list, content, delete; a
file is its key's alone; bad files and a spent quota change nothing."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import openai
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.tenants import tenants
from tests.jobstack import jobs_stack
from tests.readme_blocks import run_readme_block
from tests.waiting import eventually


def _lines(n: int) -> bytes:
    rows = [
        {
            "custom_id": f"request-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"hi {i}"}]},
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def test_files_round_trip_and_are_their_keys_alone(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    keys = tenants("alice", "bob")
    with jobs_stack(broker, s3, model, tmp_path, auth=keys.auth) as stack:
        alice = openai.OpenAI(base_url=f"{stack.base}/v1", api_key=keys.secrets["alice"])
        bob = openai.OpenAI(base_url=f"{stack.base}/v1", api_key=keys.secrets["bob"])
        body = _lines(3)
        first = alice.files.create(file=("batchinput.jsonl", body), purpose="batch")
        second = alice.files.create(file=("second.jsonl", io.BytesIO(_lines(1))), purpose="batch")
        assert (first.object, first.purpose, first.status) == ("file", "batch", "processed")
        assert first.bytes == len(body) and first.filename == "batchinput.jsonl"
        assert alice.files.retrieve(first.id).id == first.id
        assert alice.files.content(first.id).content == body
        listed = alice.files.list()
        assert [f.id for f in listed.data] == [second.id, first.id]  # newest first
        assert [f.id for f in alice.files.list(order="asc", limit=1).data] == [first.id]
        page = alice.files.list(order="asc", after=first.id)
        assert [f.id for f in page.data] == [second.id]

        # Bob sees none of it, and can change none of it.
        assert bob.files.list().data == []
        for call in (
            lambda: bob.files.retrieve(first.id),
            lambda: bob.files.content(first.id),
            lambda: bob.files.delete(first.id),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        assert alice.files.retrieve(first.id).bytes == len(body)

        deleted = alice.files.delete(first.id)
        assert deleted.deleted and deleted.id == first.id
        with pytest.raises(openai.NotFoundError):
            alice.files.retrieve(first.id)
        assert [f.id for f in alice.files.list().data] == [second.id]


def test_bad_files_are_refused_and_store_nothing(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    keys = tenants("alice")
    jobs = {"files": {"max_lines": 5, "max_file_bytes": 4096, "max_files_per_key": 2}}
    with jobs_stack(broker, s3, model, tmp_path, auth=keys.auth, jobs=jobs) as stack:
        client = openai.OpenAI(
            base_url=f"{stack.base}/v1", api_key=keys.secrets["alice"], max_retries=0
        )
        refusals = {
            "invalid_file": (b'{"custom_id": "a"}\nnot json\n', "batch"),
            "too_many_lines": (_lines(6), "batch"),
            "file_too_large": (b'{"a": "' + b"x" * 70_000 + b'"}\n', "batch"),
            "unsupported_purpose": (_lines(1), "fine-tune"),
        }
        for code, (content, purpose) in refusals.items():
            with pytest.raises(openai.APIStatusError) as refused:
                client.files.create(file=("f.jsonl", content), purpose=purpose)  # type: ignore[arg-type]
            assert refused.value.code == code, refused.value.message
            assert refused.value.status_code in (400, 413)
        if_line = httpx.post(
            f"{stack.base}/v1/files",
            json={"purpose": "batch"},
            headers=keys.headers("alice"),
        )
        assert if_line.status_code == 400 and "multipart" in if_line.json()["error"]["message"]
        assert client.files.list().data == []  # nothing stored by any refusal
        for _ in range(2):
            client.files.create(file=("f.jsonl", _lines(1)), purpose="batch")
        with pytest.raises(openai.RateLimitError) as spent:
            client.files.create(file=("f.jsonl", _lines(1)), purpose="batch")
        assert spent.value.code == "file_quota_exceeded"
        assert len(client.files.list().data) == 2


def test_the_manuals_files_example_runs_as_written(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        done = run_readme_block("files-python", stack.base, tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        first, listed, content, deleted = [line for line in done.stdout.splitlines() if line]
        file_id = first.split()[0]
        assert file_id.startswith("file-") and first.endswith(" processed")
        assert file_id in listed
        assert json.loads(content)["custom_id"] == "request-1"
        assert deleted == "True"
        gone = httpx.get(f"{stack.base}/v1/files/{file_id}")
        assert gone.status_code == 404
        assert gone.json()["error"]["code"] == "file_not_found"


def test_a_key_sending_uploads_in_parallel_holds_at_most_its_share_of_the_gateway(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Each upload may spool twice its size to the gateway's disk: a key's parallel ones
    are capped (jobs.max_concurrent_uploads_per_key), the slow one still completes.

    The slow upload is a raw socket that sends its head and holds the rest: a second upload
    of the key is then refused. Should a probe hold the key's one slot at the moment the
    slow upload arrives, the slow one is the refused one (correctly): its socket has the
    429 at once, and it is sent again."""
    import socket
    from urllib.parse import urlsplit

    jobs = {"max_concurrent_uploads_per_key": 1}
    with jobs_stack(broker, s3, model, tmp_path, jobs=jobs) as stack:
        boundary = "tgboundary"
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"'
            "\r\nContent-Type: application/octet-stream\r\n\r\n"
        ).encode() + _lines(1)
        tail = f"\r\n--{boundary}--\r\n".encode()
        where = urlsplit(stack.base)
        request = (
            f"POST /v1/files HTTP/1.1\r\nHost: {where.netloc}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
            f"Content-Length: {len(head) + len(tail)}\r\nConnection: close\r\n\r\n"
        ).encode()

        def slow_upload() -> socket.socket:
            sock = socket.create_connection((where.hostname, where.port), timeout=30)
            sock.sendall(request + head)
            return sock

        def answered_at_once(sock: socket.socket) -> bytes:
            sock.setblocking(False)
            try:
                return sock.recv(65536)
            except BlockingIOError:
                return b""
            finally:
                sock.setblocking(True)

        slow = [slow_upload()]
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)

        def refused() -> bool:
            early = answered_at_once(slow[0])
            if early:  # a probe held the slot as the slow upload arrived: it was refused
                assert b" 429 " in early.split(b"\r\n")[0], early
                slow[0].close()
                slow[0] = slow_upload()
                return False
            try:
                client.files.create(file=("b.jsonl", _lines(1)), purpose="batch")
            except openai.RateLimitError as exc:
                return exc.code == "too_many_concurrent_uploads"
            return False

        eventually(refused, 30, 0.2, "a second parallel upload of the key refused")
        sock = slow[0]
        try:
            sock.sendall(tail)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        finally:
            sock.close()
        assert answer.split(b"\r\n")[0].endswith(b" 200 OK"), answer
        assert client.files.create(file=("c.jsonl", _lines(1)), purpose="batch").bytes > 0


def test_a_slow_download_holds_a_slot_of_its_key_until_its_client_is_gone(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """A file is served from a temporary copy on the gateway's disk that lives until the
    client has read it: a key's downloads and uploads count against one share of those
    transfers (jobs.max_concurrent_uploads_per_key), so a key reading slowly, or many
    downloads at once, cannot fill the disk; a client that leaves mid-body gives its slot
    back."""
    import socket
    from urllib.parse import urlsplit

    jobs = {"max_concurrent_uploads_per_key": 1}
    with jobs_stack(broker, s3, model, tmp_path, jobs=jobs) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)
        row = json.loads(_lines(1))
        row["body"]["messages"][0]["content"] = "x" * 10_000
        big = b"".join(
            json.dumps({**row, "custom_id": f"r{i}"}).encode() + b"\n" for i in range(3000)
        )
        file_id = client.files.create(file=("big.jsonl", big), purpose="batch").id
        where = urlsplit(stack.base)
        sock = socket.create_connection((where.hostname, where.port), timeout=30)
        try:
            sock.sendall(
                f"GET /v1/files/{file_id}/content HTTP/1.1\r\nHost: {where.netloc}\r\n\r\n".encode()
            )
            assert sock.recv(64).startswith(b"HTTP/1.1 200")  # and reads no more of it
            with pytest.raises(openai.RateLimitError) as refused:
                client.files.create(file=("b.jsonl", _lines(1)), purpose="batch")
            assert refused.value.code == "too_many_concurrent_uploads"
        finally:
            sock.close()

        def upload_again() -> bool:
            try:
                return client.files.create(file=("c.jsonl", _lines(1)), purpose="batch").bytes > 0
            except openai.RateLimitError:
                return False

        eventually(upload_again, 30, 0.2, "the key's slot given back by the gone client")
