#!/usr/bin/env python3
"""Writes libm.json: values the C library (through Python's float ops) gives
for the scalar arithmetic that torch.optim does in Python: beta**step for the
bias corrections, cos for the cosine schedule, and whole learning-rate
schedules computed with the recursive formulas documented in schedule.go.
Run: python3 gen_libm.py > libm.json (any CPython on glibc)."""
import json, math

pow_cases = []
for beta in (0.9, 0.999, 0.99, 0.95, 0.5, 0.8, 0.9999, 0.123, 0.98765):
    steps = list(range(1, 301)) + [1000, 4097, 10000, 123457, 1000000]
    pow_cases.append({"beta": beta, "steps": steps, "pow": [beta ** float(s) for s in steps]})

cos_args = []
for T in range(1, 41):
    for k in range(0, 3 * T + 1):
        cos_args += [math.pi * k / T, math.pi / T]
cos_args += [x / 7.0 for x in range(-200, 201)]
cos_args = sorted(set(cos_args))
cos_cases = {"x": cos_args, "cos": [math.cos(x) for x in cos_args]}

def step_lr(lr, step_size, gamma, epochs):
    out = [lr]
    for e in range(1, epochs + 1):
        if e % step_size == 0:
            lr = lr * gamma
        out.append(lr)
    return out

def cosine_rule(lr, base, e, T, eta):
    if (e - 1 - T) % (2 * T) == 0:
        return lr + (base - eta) * (1 - math.cos(math.pi / T)) / 2
    return (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T)) * (lr - eta) + eta

def cosine(lr, T, eta, epochs):
    base, out = lr, [lr]
    for e in range(1, epochs + 1):
        lr = cosine_rule(lr, base, e, T, eta)
        out.append(lr)
    return out

def chained(lr, step_size, gamma, T, eta, epochs):
    # StepLR built first, then CosineAnnealingLR; each epoch steps both in that order.
    base, out = lr, [lr]
    for e in range(1, epochs + 1):
        if e % step_size == 0:
            lr = lr * gamma
        lr = cosine_rule(lr, base, e, T, eta)
        out.append(lr)
    return out

schedules = [
    {"kind": "step", "lr": 0.1, "step_size": 3, "gamma": 0.1, "epochs": 20, "lrs": step_lr(0.1, 3, 0.1, 20)},
    {"kind": "step", "lr": 0.05, "step_size": 1, "gamma": 0.9, "epochs": 30, "lrs": step_lr(0.05, 1, 0.9, 30)},
    {"kind": "cosine", "lr": 0.1, "t_max": 10, "eta_min": 0.001, "epochs": 45, "lrs": cosine(0.1, 10, 0.001, 45)},
    {"kind": "cosine", "lr": 0.3, "t_max": 7, "eta_min": 0.0, "epochs": 30, "lrs": cosine(0.3, 7, 0.0, 30)},
    {"kind": "chained", "lr": 0.1, "step_size": 4, "gamma": 0.5, "t_max": 6, "eta_min": 0.01, "epochs": 25,
     "lrs": chained(0.1, 4, 0.5, 6, 0.01, 25)},
]
json.dump({"pow": pow_cases, "cos": cos_cases, "schedules": schedules}, __import__("sys").stdout)
