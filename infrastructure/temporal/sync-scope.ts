// A value held while a function runs synchronously, and only then: the two methods the Temporal SDK
// uses of its AsyncLocalStorages (`run`, `getStore`), without one. Node 20 turns on its promise
// hooks for the whole process at the first `AsyncLocalStorage.run` and never turns them off; from
// then on every promise calls into JavaScript at its creation and around each of its callbacks.
// A worker that ran one activity paid that on every later promise: about a tenth of its CPU on
// batch lines (docs/performance.md). What reads the value must do so before its first `await`.
export class SyncScope<T> {
  private value: T | undefined;

  run<R, A extends unknown[]>(value: T, fn: (...args: A) => R, ...args: A): R {
    const outer = this.value;
    this.value = value;
    try {
      return fn(...args);
    } finally {
      this.value = outer;
    }
  }

  getStore(): T | undefined {
    return this.value;
  }
}
