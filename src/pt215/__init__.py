"""pt215: the helper package of the book "PyTorch 2.15 in Practice".

One module per topic, each named for what it does and pointing to the chapter that uses it:
`hardware` and `launch` (every chapter), `book` (the website), and the chapter modules.
"""

__version__ = "0.1.0"
