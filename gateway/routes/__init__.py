"""The HTTP routes: completions (the proxy), documents, records and audits, models/health/metrics."""
