"""One probe over every public name and every kind of bad input."""
