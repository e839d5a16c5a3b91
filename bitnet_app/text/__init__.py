"""Text in and out of the model: tokenizer.py (encode, incremental decode), chat.py (the chat template, message
text never forging special tokens) and sandbox.py (untrusted templates rendered with time and size limits)."""
