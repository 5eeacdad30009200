"""`coda bench`: closed-loop replay of agent sessions against any OpenAI-compatible endpoint."""
