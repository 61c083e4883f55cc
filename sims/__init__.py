"""A step-level simulator of an SGLang server with chain (topk 1) speculative decoding."""
