// Node's timer range, for the places where a user's numbers (a replay's --timeout-s, a trace
// slowed by --speedup, the mocker's --speedup-ratio) set how long to wait.

/**
 * Longest delay setTimeout honours (2^31 − 1 ms, about 24.8 days): Node runs a longer one
 * after 1 ms, with only a TimeoutOverflowWarning to say so.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1
