// Pages of results kept in a process's memory, the least recently read leaving first. A page is written once
// and never changed (a batch's deletion removes its document first, so its pages are no longer
// asked for), so a kept page is always right. A client that polls a finished batch reads all of its
// results each time (the interface puts them in the batch object): a 50,000-line batch cost FerretDB
// 3 s of CPU a read, 100 ns a byte, whatever the pages' layout.
import type { ResultPage } from './page-form';

/** Characters of result text kept per process: two batches of 50,000 short chat lines. */
const PAGE_CACHE_CHARS = 64 * 1024 * 1024;

const charsOf = (page: ResultPage) => page.lines.reduce((n, l) => n + l.length, 0);

export class PageCache {
  private readonly pages = new Map<string, { page: ResultPage; chars: number }>();
  private chars = 0;

  constructor(private readonly budgetChars = PAGE_CACHE_CHARS) {}

  /** A kept page, now the most recently read. */
  get(id: string): ResultPage | undefined {
    const e = this.pages.get(id);
    if (!e) return undefined;
    this.pages.delete(id);
    this.pages.set(id, e);
    return e.page;
  }

  /** Keeps a page read from the store, dropping the least recently read past the budget. */
  add(page: ResultPage): void {
    if (this.pages.has(page._id)) return;
    const chars = charsOf(page);
    if (chars > this.budgetChars / 8) return; // a page of huge results would push out many
    this.pages.set(page._id, { page, chars });
    this.chars += chars;
    for (const [id, e] of this.pages) {
      if (this.chars <= this.budgetChars) break;
      this.pages.delete(id);
      this.chars -= e.chars;
    }
  }

  get heldChars(): number {
    return this.chars;
  }
}
