// Pages of results kept in a process's memory, the least recently read leaving first. A page is written once
// and never changed (a batch's deletion removes its document first, so its pages are no longer
// asked for), so a kept page is always right. A client that polls a finished batch reads all of its
// results each time (the interface puts them in the batch object): a 50,000-line batch cost FerretDB
// 3 s of CPU a read as it was stored then, 0.3–0.4 s deflated (page-form.ts), and none from here.
import { SizedLru } from '../../infrastructure/concurrency/sized-lru';
import type { ResultPage } from './page-form';

/** Characters of result text kept per process: two batches of 50,000 short chat lines. */
const PAGE_CACHE_CHARS = 64 * 1024 * 1024;

export class PageCache {
  private readonly pages: SizedLru<ResultPage>;

  constructor(budgetChars = PAGE_CACHE_CHARS) {
    this.pages = new SizedLru(budgetChars);
  }

  /** A kept page, now the most recently read. */
  get(id: string): ResultPage | undefined {
    return this.pages.get(id);
  }

  /** Keeps a page read from the store (not one of more than an eighth of the budget). */
  add(page: ResultPage): void {
    this.pages.set(
      page._id,
      page,
      page.lines.reduce((n, l) => n + l.length, 0),
    );
  }

  get heldChars(): number {
    return this.pages.held;
  }
}
