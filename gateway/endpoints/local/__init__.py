"""The in-process local endpoint: the engine behind the OpenAI routes."""
