"""The OpenAI-compatible server over trellisforge.Engine: `python -m server`."""
