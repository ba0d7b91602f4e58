"""Job environments (issue 11): a root file system built reproducibly from a small manifest
with mmdebstrap (:mod:`.build`), identified by the sha256 of its tar, stored in object
storage under that digest with names pointing at digests (:mod:`.registry`), and fetched
and unpacked once per worker into a read-only cache (:mod:`.cache`) that the sandbox
binds as its root (:func:`tiergate.sandbox.bwrap.bwrap_argv`, ``root=``); a name kept
pointing at a build of one manifest, rebuilt only when the manifest changes, by
:mod:`.ensure` (``tiergate up``'s ``default``)."""

from tiergate.envs.manifest import Manifest, load_manifest

__all__ = ["Manifest", "load_manifest"]
