"""The search machinery: objective, sensitivity ranking, bisection, evaluation pool, cost."""
