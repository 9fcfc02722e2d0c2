"""The OpenAI Responses API front door (``/v1/responses``): docs/responses-api.md."""
