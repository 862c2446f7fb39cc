"""The LLM judge: its configuration and verdicts (``config``), the OpenAI-compatible client
(``client``), the on-disk verdict cache (``cache``), the rubrics and prompts (``rubrics``) and the
same-step question that ``tracedag validate learn --merge semantic`` asks (``same_step``)."""
