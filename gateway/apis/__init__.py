"""Front doors for client APIs other than OpenAI's Chat Completions: one subpackage each."""
