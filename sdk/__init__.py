"""draftgate SDK: a client for the draftgate gateway and any OpenAI-compatible endpoint."""

__version__ = "0.1.0"
