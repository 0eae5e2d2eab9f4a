"""Teachers: how each one scores the student's completions (its own template, another
tokenizer aligned by bytes, a server, a mixture), and the preflight that names its mode."""
