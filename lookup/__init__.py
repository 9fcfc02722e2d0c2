"""draftgate lookup: model-free drafting (n-gram/suffix indexes, the drafter, the document corpus)."""
