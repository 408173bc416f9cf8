// A conversation's turns as a tree, and which branch is on screen. A turn is a response;
// its siblings are the turns that share its parent (edits and regenerations). The page keeps
// only the choice of branch: the turns themselves are the server's.

export class Branches {
  constructor() {
    this.load(null);
    this.choice = new Map(); // parent key ("" for roots) -> the child on screen
    this.branchAt = undefined; // undefined: the path; null: a new first turn; id: after it
  }

  load(conv) {
    this.conv = conv;
    this.byId = new Map();
    this.kids = new Map(); // parent key -> child ids, oldest first
    for (const t of conv ? conv.turns : []) this.byId.set(t.id, t);
    for (const t of conv ? conv.turns : []) {
      const key = this.parentKey(t);
      if (!this.kids.has(key)) this.kids.set(key, []);
      this.kids.get(key).push(t.id);
    }
  }

  get turns() {
    return this.conv ? this.conv.turns : [];
  }

  parentKey(turn) {
    return turn.previous && this.byId.has(turn.previous) ? turn.previous : "";
  }

  // The turns on screen: from a root down, each step the chosen (else newest) child; cut
  // where a branch is about to start.
  path(choice = this.choice) {
    const out = [];
    let key = "";
    for (;;) {
      const list = this.kids.get(key);
      if (!list) break;
      const pick = list.includes(choice.get(key)) ? choice.get(key) : list[list.length - 1];
      out.push(this.byId.get(pick));
      key = pick;
    }
    if (choice !== this.choice || this.branchAt === undefined) return out;
    if (this.branchAt === null) return [];
    return out.slice(0, out.findIndex((t) => t.id === this.branchAt) + 1);
  }

  // Put turn `id` on screen (or on the branch `choice` describes).
  show(id, choice = this.choice) {
    for (let t = this.byId.get(id); t; t = this.byId.get(t.previous)) {
      choice.set(this.parentKey(t), t.id);
    }
  }

  // The branch through `id`, down to its newest leaf (the side-by-side view's other column).
  branchThrough(id) {
    const choice = new Map();
    this.show(id, choice);
    return this.path(choice);
  }

  siblings(turn) {
    return this.kids.get(this.parentKey(turn)) || [turn.id];
  }
}
