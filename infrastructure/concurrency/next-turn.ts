// Large requests and answers are worked through in several turns of the event loop, so that other
// requests' turns run in between: a 9.5 MB call held the loop 182-268 ms in one turn.

/** Each step of work on at least this many bytes (or characters) of one body has a turn of its own: 1 MB takes ~20 ms. */
export const TURN_SPLIT_BYTES = 1024 * 1024;

/** Resolves in a later turn of the event loop, after what waits on it now (I/O included). */
export const nextTurn = (): Promise<void> => new Promise<void>((resolve) => setImmediate(resolve));
