"""draftgate gateway: the OpenAI-compatible proxy."""
