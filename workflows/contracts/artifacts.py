"""Model artifacts: what the control plane's mirror holds and nodes fetch (issue 14).

An artifact is a manifest of files, each named by the sha256 of its bytes; the manifest itself
is named by the sha256 of its canonical JSON (`manifest_digest`), so the same files under the
same names are one artifact wherever they came from. Blobs are deduplicated across artifacts.
No secret ever appears here: a source that needs a token names where to read it
(workflows/artifact_names.py has the pure rules for digests and paths).
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class ArtifactFile(BaseModel):
    # The file's path inside the artifact, "/"-separated and relative ("model.gguf",
    # "tokenizer/config.json"): checked by artifact_names.check_relative_path.
    path: str
    # "sha256:<64 lowercase hex>" of the file's bytes.
    digest: str
    size: int = Field(ge=0)


class ArtifactManifest(BaseModel):
    """The files of one artifact, sorted by path. `source` says where they were taken from
    (a URL without credentials, a local path, "ollama:NAME:TAG"): for people, not for lookup."""

    files: list[ArtifactFile]
    source: str = ""

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)
