"""The Anthropic Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) in
front of every endpoint kind: requests translated to the internal chat request
(:mod:`.request`), answers transcoded back (:mod:`.response`, :mod:`.stream`), errors in
Anthropic's shape (:mod:`.errors`), the door itself (:mod:`.door`) and the token count
(:mod:`.count_tokens`). docs/anthropic-api.md says what each field becomes."""
