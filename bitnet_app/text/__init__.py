"""Text in and out of the model: tokenizer.py (encode, incremental decode) and chat.py (the chat template)."""
