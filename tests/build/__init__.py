"""Checks of the build and the repository: the kernel library and its table, the wheel, the extension, the
sm100 static checks, the docs paths, seeding."""
