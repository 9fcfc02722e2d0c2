"""How a round trip to the engine fails."""


class RemoteFailure(Exception):
    """A round trip to the engine failed (unreachable, an error status, a deadline, an
    answer too large or not the documented shape)."""


class UnusableAnswer(RemoteFailure):
    """The engine answered, but with values it cannot have computed (a token id outside the
    vocabulary, a non-finite or positive logprob, a rank below 1, rows missing or out of
    order), or could not serialise its answer (non-finite floats)."""
