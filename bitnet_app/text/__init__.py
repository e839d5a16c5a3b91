"""Text in and out of the model: tokenizer.py (encode, incremental decode), chat.py (the chat template, message
text never forging special tokens), sandbox.py (untrusted templates rendered with time and size limits) and
tokenizer_checks.py (at conversion: a tokenizer that agrees with itself, the config and the template)."""
