"""One agent vocabulary over the GenAI, OpenInference and OpenLLMetry dialects."""
