"""Pure cost functions: compute roofline, collective alpha-beta, memory, FLOPs. No simpy."""
