"""Where a request goes: HTTP upstreams (transport, providers, capabilities) and the local endpoint."""
