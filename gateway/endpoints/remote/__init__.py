"""Remote verification: the gateway drafts, an SGLang or vLLM server scores the drafts."""
