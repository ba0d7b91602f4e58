"""Tier fitting: choosing the fast tier's recipe by measuring candidates on this hardware.

Nothing on the request path imports this package.
"""
