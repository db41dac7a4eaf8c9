"""evo-attention: evolutionary search over attention mechanisms."""
