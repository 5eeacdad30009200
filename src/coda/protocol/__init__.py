"""The wire formats Coda speaks, shared by the gateway, the fake engine, the bench and the vLLM
plugin, and owned by none of them: the API dialects' request and response shapes (``dialects``),
the word tokenizer and chat template (``tokenizer``), vLLM's metric bucket boundaries
(``buckets``) and vLLM's KV-cache event messages (``kv_events``)."""
