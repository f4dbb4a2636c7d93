"""The project's own pictures of its environments' states, numpy only (tools/video.py draws
DarkRoom and both Tag games with them), and the header with the step number that every video
frame gets. y points up, as in the environments.
"""

from __future__ import annotations

import numpy as np

BACKGROUND = (245, 245, 245)
GRID_LINE = (215, 215, 215)
VISITED = (198, 219, 239)
GOAL = (44, 160, 44)
AGENT = (31, 119, 180)
TEAM_COLOURS = {0: (214, 39, 40), 1: (31, 119, 180)}   # tag.TAGGER red, tag.RUNNER blue
TAGGED = (150, 150, 150)
CROSS = (40, 40, 40)
HEADER = (40, 40, 40)
TEXT = (255, 255, 255)
BOARD_PIXELS = 352     # about the board's side; grids snap to whole cells
HEADER_PIXELS = 16
# 3 x 5 digits, row by row: the step number in each frame's header
DIGITS = {"0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
          "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
          "8": "111101111101111", "9": "111101111001111"}


def with_header(board: np.ndarray, step: int) -> np.ndarray:
    """The board under a dark strip with the step number, padded to sides that are multiples of
    16 (what MP4 encoders take without rescaling)."""
    h, w = board.shape[:2]
    height, width = 16 * -(-(h + HEADER_PIXELS) // 16), 16 * -(-w // 16)
    frame = np.empty((height, width, 3), np.uint8)
    frame[:] = BACKGROUND
    frame[:HEADER_PIXELS] = HEADER
    top, left = HEADER_PIXELS + (height - HEADER_PIXELS - h) // 2, (width - w) // 2
    frame[top:top + h, left:left + w] = board
    scale, x = 2, 4
    for ch in str(step):
        glyph = np.array([int(c) for c in DIGITS[ch]], bool).reshape(5, 3)
        frame[3:3 + 5 * scale, x:x + 3 * scale][np.kron(glyph, np.ones((scale, scale), bool))] = TEXT
        x += 4 * scale
    return frame


def _grid(cells: int) -> tuple[np.ndarray, int]:
    """An empty board of `cells` x `cells` square cells, and the cell's side in pixels."""
    side = max(2, BOARD_PIXELS // cells)
    board = np.empty((cells * side, cells * side, 3), np.uint8)
    board[:] = BACKGROUND
    if side >= 8:   # grid lines only where cells are large enough to see them
        board[::side] = GRID_LINE
        board[:, ::side] = GRID_LINE
    return board, side


def _cell(board, side: int, cells: int, x: int, y: int, colour, inset: int = 0) -> None:
    row = (cells - 1 - int(y)) * side
    col = int(x) * side
    board[row + inset:row + side - inset, col + inset:col + side - inset] = colour


def _window(board, row: float, col: float, radius: float):
    """The part of `board` within `radius` of (row, col), and the offsets of its pixels from it."""
    r0, r1 = max(0, int(row - radius)), min(board.shape[0], int(row + radius) + 2)
    c0, c1 = max(0, int(col - radius)), min(board.shape[1], int(col + radius) + 2)
    rows, cols = np.ogrid[r0:r1, c0:c1]
    return board[r0:r1, c0:c1], rows - row, cols - col


def _disc(board, row: float, col: float, radius: float, colour) -> None:
    part, dr, dc = _window(board, row, col, radius)
    part[dr ** 2 + dc ** 2 <= radius ** 2] = colour


def _cross(board, row: float, col: float, radius: float, colour) -> None:
    part, dr, dc = _window(board, row, col, radius)
    near = (np.abs(dr) <= radius) & (np.abs(dc) <= radius)
    part[near & ((np.abs(dr - dc) <= 1) | (np.abs(dr + dc) <= 1))] = colour


def darkroom(env, env_params, states, k: int) -> np.ndarray:
    """The room: the cells of the kept states so far shaded (with --video-stride 1, every cell
    visited so far), the goal green, the agent a blue disc."""
    n = env.size
    board, side = _grid(n)
    for x, y in np.unique(np.asarray(states.pos)[:k + 1], axis=0):
        _cell(board, side, n, x, y, VISITED, inset=1)
    gx, gy = np.asarray(env_params.goal)
    _cell(board, side, n, gx, gy, GOAL, inset=1)
    x, y = np.asarray(states.pos)[k]
    _disc(board, (n - 1 - y + 0.5) * side, (x + 0.5) * side, 0.35 * side, AGENT)
    return board


def tag_grid(env, env_params, states, k: int) -> np.ndarray:
    """Taggers red squares, the runner a blue disc over them; tagged, it turns grey and crossed."""
    n = int(env_params.grid_length) + 1   # cells 0 .. grid_length on each axis
    board, side = _grid(n)
    pos, active = np.asarray(states.pos)[k], np.asarray(states.active)[k]
    inset = max(1, side // 8)
    for i in range(env.num_taggers):
        _cell(board, side, n, *pos[i], TEAM_COLOURS[int(env.team_ids[i])], inset=inset)
    for i in range(env.num_taggers, env.num_agents):
        x, y = pos[i]
        row, col = (n - 1 - y + 0.5) * side, (x + 0.5) * side
        _disc(board, row, col, 0.3 * side, TEAM_COLOURS[int(env.team_ids[i])] if active[i] else TAGGED)
        if not active[i]:
            _cross(board, row, col, 0.45 * side, CROSS)
    return board


def tag_continuous(env, env_params, states, k: int) -> np.ndarray:
    """Agents as discs coloured by team, with a tick along their heading; a tagged runner grey
    and crossed where it left the game. The square is framed, with a margin for agents on its
    edges."""
    size = BOARD_PIXELS
    radius = max(3.0, size / 70)
    margin = int(np.ceil(2.2 * radius)) + 1
    board = np.empty((size, size, 3), np.uint8)
    board[:] = BACKGROUND
    board[[margin - 1, size - margin], margin - 1:size - margin + 1] = GRID_LINE
    board[margin - 1:size - margin + 1, [margin - 1, size - margin]] = GRID_LINE
    scale = (size - 2 * margin - 1) / float(env_params.grid_length)
    pos, active = np.asarray(states.pos)[k], np.asarray(states.active)[k]
    direction = np.asarray(states.direction)[k]
    for i in np.argsort(active, kind="stable"):   # agents out of the game first, under the others
        row, col = size - 1 - margin - pos[i, 1] * scale, margin + pos[i, 0] * scale
        if not active[i]:
            _disc(board, row, col, radius, TAGGED)
            _cross(board, row, col, radius * 1.5, CROSS)
            continue
        colour = TEAM_COLOURS[int(env.team_ids[i])]
        _disc(board, row, col, radius, colour)
        for along in np.linspace(radius, 2.2 * radius, 6):
            board[int(round(row - along * np.sin(direction[i]))), int(round(col + along * np.cos(direction[i])))] = colour
    return board


# {env name: (drawing of kept state k: (env, env_params, states, k) -> RGB board, frames per second)}
DRAWN = {"DarkRoom": (darkroom, 5.0), "DarkRoomHard": (darkroom, 5.0),
         "TagGridworld-v0": (tag_grid, 10.0), "TagContinuous-v0": (tag_continuous, 10.0)}
