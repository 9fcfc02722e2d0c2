"""Where a request goes: one object per configured endpoint, each following the
``Endpoint`` protocol (``endpoint.py``): HTTP upstreams (``hosted/``), remote
verification in front of one (``verifying.py`` over ``remote/``) and the in-process engine
(``local/``); what each kind accepts (``capabilities.py``) and its adapter
(``providers.py``) come from the provider table, ``gateway/provider_table.py``."""
