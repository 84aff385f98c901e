"""The serving runtime: sessions, admission, the plan in force, the duty cycle, execution
and the hand-off between threads.
"""
