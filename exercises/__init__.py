"""Candidate exercise files: fill these in and grade them with attn-grade."""
