"""Flow control: queues, budgets, saturation and their policies."""
