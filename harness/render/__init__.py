"""The plans the pictures draw, the synthetic elastic engine, and the browser that measures
them."""
