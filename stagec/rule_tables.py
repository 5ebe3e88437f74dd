"""Tables of rules keyed by op, as JAX keys its rules by primitive: one decorator files them."""


def registrar(table: dict):
    """`register = registrar(TABLE)`, then `@register(op, ...)` files a function under each op."""
    def register(*keys):
        def wrap(fn):
            for key in keys:
                table[key] = fn
            return fn
        return wrap
    return register
