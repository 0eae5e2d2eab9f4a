"""Conversations as OpenAI's fine-tuning format and TRL's conversational datasets write them:
the messages and tools of one conversation, the rules OpenAI's validator holds them to
(`conversation.py`), and the files that hold them, read and checked line by line
(`files.py`). The API's upload check and the worker's reading share both."""
