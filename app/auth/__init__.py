"""Who is calling: teams, their API keys (hashed), what each key may do, and the
dashboard's signed browser sessions."""
