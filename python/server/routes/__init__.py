"""The endpoints, one module each: chat.py, completions.py, models.py (models, health, metrics)."""
