const m = (l) => { gc({type:"major",flavor:"last-resort"}); const u = process.memoryUsage(); console.log(l.padEnd(50), "rss", (u.rss/1048576).toFixed(1), "heap", (u.heapUsed/1048576).toFixed(1)); };
m("start");
for (const mod of process.env.MODS.split(" ")) { await import(mod); m(mod); }
