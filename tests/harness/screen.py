"""A small VT100 screen: what a terminal would show after a program's output.

Enough of ECMA-48 for full-screen programs like ``metagpu top``: cursor
moves (CUP, CUU/CUD/CUF/CUB), erase in line and display (EL, ED), the
alternate screen (``?1049``) and cursor visibility (``?25``); SGR (colours) is
accepted and ignored. Any other escape sequence is recorded in
:attr:`Screen.unknown`, so a test can assert the program wrote nothing this
model (and so, perhaps, a terminal) would misread.

Reading the screen rather than the byte stream is what makes a terminal test
honest: a frame drawn in place over a longer one, a line left unerased, or a
screen not restored on exit all show up as what a person would see.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_CSI = re.compile(r"\x1b\[([?]?)([0-9;]*)([@-~])")


@dataclass
class Screen:
    rows: int
    cols: int
    main: list[list[str]] = field(init=False)
    alt: list[list[str]] = field(init=False)
    on_alt: bool = False
    cursor_visible: bool = True
    row: int = 0
    col: int = 0
    unknown: list[str] = field(default_factory=list)
    _saved: tuple[int, int] = (0, 0)
    _pending: str = ""

    def __post_init__(self) -> None:
        self.main = self._blank()
        self.alt = self._blank()

    def _blank(self) -> list[list[str]]:
        return [[" "] * self.cols for _ in range(self.rows)]

    @property
    def grid(self) -> list[list[str]]:
        return self.alt if self.on_alt else self.main

    def lines(self) -> list[str]:
        """The visible screen, one string per row, trailing blanks removed."""
        return ["".join(r).rstrip() for r in self.grid]

    def text(self) -> str:
        return "\n".join(self.lines()).rstrip("\n")

    def resize(self, rows: int, cols: int) -> None:
        """As a terminal window resized: contents cut or padded, cursor kept inside."""

        def fit(grid: list[list[str]]) -> list[list[str]]:
            out = [(r + [" "] * cols)[:cols] for r in grid[:rows]]
            return out + [[" "] * cols for _ in range(rows - len(out))]

        self.main, self.alt = fit(self.main), fit(self.alt)
        self.rows, self.cols = rows, cols
        self.row, self.col = min(self.row, rows - 1), min(self.col, cols - 1)

    def feed(self, data: str) -> None:
        """Apply output; an escape sequence split across two reads is kept for the next."""
        data = self._pending + data
        self._pending = ""
        i = 0
        while i < len(data):
            ch = data[i]
            if ch == "\x1b":
                if i + 1 >= len(data):
                    self._pending = data[i:]
                    return
                if data[i + 1] != "[":
                    self.unknown.append(repr(data[i : i + 2]))
                    i += 2
                    continue
                match = _CSI.match(data, i)
                if match is None:
                    if re.fullmatch(r"\x1b\[[?]?[0-9;]*", data[i:]):
                        self._pending = data[i:]  # the rest arrives with the next read
                        return
                    self.unknown.append(repr(data[i : i + 3]))
                    i += 2
                    continue
                self._csi(*match.groups())
                i = match.end()
                continue
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self._line_feed()
            elif ch == "\b":
                self.col = max(0, self.col - 1)
            elif ch >= " ":
                if self.col >= self.cols:  # autowrap, as VT100 does on the next character
                    self.col = 0
                    self._line_feed()
                self.grid[self.row][self.col] = ch
                self.col += 1
            i += 1

    def _line_feed(self) -> None:
        if self.row == self.rows - 1:
            self.grid.pop(0)
            self.grid.append([" "] * self.cols)
        else:
            self.row += 1

    def _csi(self, private: str, params: str, final: str) -> None:
        args = [int(p) if p else 0 for p in params.split(";")] if params else []

        def arg(n: int, default: int) -> int:
            return args[n] if len(args) > n and args[n] else default

        if private == "?":
            if final not in "hl":
                self.unknown.append(f"CSI ?{params}{final}")
                return
            on = final == "h"
            for mode in args:
                if mode == 1049:
                    if on and not self.on_alt:
                        self._saved = (self.row, self.col)
                        self.alt = self._blank()
                        self.on_alt = True
                    elif not on and self.on_alt:
                        self.on_alt = False
                        self.row, self.col = self._saved
                elif mode == 25:
                    self.cursor_visible = on
                else:
                    self.unknown.append(f"CSI ?{mode}{final}")
            return
        if final in "Hf":
            self.row = min(arg(0, 1), self.rows) - 1
            self.col = min(arg(1, 1), self.cols) - 1
        elif final == "A":
            self.row = max(0, self.row - arg(0, 1))
        elif final == "B":
            self.row = min(self.rows - 1, self.row + arg(0, 1))
        elif final == "C":
            self.col = min(self.cols - 1, self.col + arg(0, 1))
        elif final == "D":
            self.col = max(0, self.col - arg(0, 1))
        elif final == "K":
            line, mode = self.grid[self.row], arg(0, 0)
            start, end = {0: (self.col, self.cols), 1: (0, self.col + 1), 2: (0, self.cols)}[mode]
            line[start:end] = [" "] * (min(end, self.cols) - start)
        elif final == "J":
            mode = arg(0, 0)
            if mode == 2:
                self.grid[:] = self._blank()
            elif mode == 0:
                self._csi("", "0", "K")
                for r in range(self.row + 1, self.rows):
                    self.grid[r] = [" "] * self.cols
            elif mode == 1:
                self._csi("", "1", "K")
                for r in range(self.row):
                    self.grid[r] = [" "] * self.cols
        elif final == "m":
            pass  # colours and attributes: not what a test reads
        else:
            self.unknown.append(f"CSI {params}{final}")
