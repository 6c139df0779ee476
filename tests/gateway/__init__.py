"""The OpenAI gateway on both front ends and upstream clients, against simulated model servers."""
