// Loads the compiled addon built by `npm run build` (prosody.<platform>.node beside this file).
"use strict";

const { readdirSync } = require("node:fs");
const { join } = require("node:path");

function candidates() {
  const { platform, arch } = process;
  const abi = platform === "linux" ? (process.report?.getReport?.().header?.glibcVersionRuntime ? "-gnu" : "-musl") : "";
  const preferred = [`prosody.${platform}-${arch}${abi}.node`, `prosody.${platform}-${arch}.node`, "prosody.node"];
  const present = new Set(readdirSync(__dirname).filter((name) => /^prosody(\..+)?\.node$/.test(name)));
  return preferred.filter((name) => present.has(name));
}

const found = candidates();
if (found.length === 0) {
  throw new Error(
    `@prosody-events/prosody: no native addon for ${process.platform}-${process.arch} in ${__dirname}; ` +
      "run `npm run build` in the package directory",
  );
}

module.exports = require(join(__dirname, found[0]));
