"""draftgate local_verifier: the local target model and lossless draft verification."""
