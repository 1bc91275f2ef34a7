"""Models Ollama has already pulled: its local store read (store.py, the GGUF header in
ollama/gguf_header.py, blobs copied and verified in blobs.py), served as a model of llmgw's
(`llmgw model import-ollama`, model_import.py) or added to the mirror (`llmgw mirror add
ollama://...`, mirror_add.py)."""
