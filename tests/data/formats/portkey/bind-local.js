// Force every listening socket of the gateway onto 127.0.0.1 (its start-server listens on all interfaces).
const net = require('net');
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'number') return listen.call(this, args[0], '127.0.0.1', ...args.slice(1).filter((a) => typeof a === 'function'));
  if (args[0] && typeof args[0] === 'object') return listen.call(this, { ...args[0], host: '127.0.0.1' }, ...args.slice(1));
  return listen.apply(this, args);
};
