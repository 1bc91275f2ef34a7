"""The control plane's model mirror (issue 14): a content-addressed store of model files under
`<state>/mirror/`, filled from local files, HTTP(S) URLs, Hugging Face-layout repositories and
Ollama's store. docs/models.md ("The mirror") describes the layout and the guarantees."""
