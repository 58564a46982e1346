// SPDX-License-Identifier: GPL-2.0-only
/*
 * gdr_pci_standin: PCI functions of a lab guest named as GPUs (the gdrprobe lab's rails
 * guest, lab/rails.py). QEMU has no device that answers with NVIDIA's vendor id, so this
 * module rewrites the identity the PCI core keeps for each function named in `gpus`
 * (comma-separated bus ids): vendor 0x10de and class 3D controller, which
 * /sys/bus/pci/devices/<bdf>/vendor and /class show (drivers/pci/pci-sysfs.c reads them
 * from struct pci_dev, not from config space). The stand-in libcuda.so.1 then lists GPUs at
 * those bus ids (GDRPROBE_STANDIN_BUS_IDS), so NCCL's rules and the doctor place them in
 * the guest's real PCI tree. The identities come back on unload.
 *
 * Emulation, not hardware: nothing behind these functions is a GPU.
 */
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/string.h>

#define STANDIN_MAX 8
#define NVIDIA_3D_CONTROLLER 0x030200
#define STANDIN_DEVICE_ID 0x2335	/* an H200's, for a name only */

static char *gpus = "";
module_param(gpus, charp, 0444);
MODULE_PARM_DESC(gpus, "bus ids (0000:03:00.0,...) to show as NVIDIA GPUs");

struct identity {
	struct pci_dev *pdev;
	unsigned short vendor, device;
	unsigned int class;
};

static struct identity renamed[STANDIN_MAX];
static int renamed_count;

static int rename_one(const char *bus_id)
{
	unsigned int domain, bus, slot, function;
	struct pci_dev *pdev;
	struct identity *kept;

	if (sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4)
		return -EINVAL;
	if (renamed_count == STANDIN_MAX)
		return -E2BIG;
	pdev = pci_get_domain_bus_and_slot(domain, bus, PCI_DEVFN(slot, function));
	if (!pdev)
		return -ENODEV;
	kept = &renamed[renamed_count++];
	*kept = (struct identity){ pdev, pdev->vendor, pdev->device, pdev->class };
	pdev->vendor = PCI_VENDOR_ID_NVIDIA;
	pdev->device = STANDIN_DEVICE_ID;
	pdev->class = NVIDIA_3D_CONTROLLER;
	return 0;
}

static void restore_all(void)
{
	while (renamed_count) {
		struct identity *kept = &renamed[--renamed_count];

		kept->pdev->vendor = kept->vendor;
		kept->pdev->device = kept->device;
		kept->pdev->class = kept->class;
		pci_dev_put(kept->pdev);
	}
}

static int __init standin_init(void)
{
	char *list = kstrdup(gpus, GFP_KERNEL), *cursor = list, *bus_id;
	int err = 0;

	if (!list)
		return -ENOMEM;
	while (!err && (bus_id = strsep(&cursor, ",")))
		if (*bus_id)
			err = rename_one(bus_id);
	kfree(list);
	if (err) {
		pr_err("gdr_pci_standin: cannot name '%s' a GPU: %d\n", gpus, err);
		restore_all();
	}
	return err;
}

static void __exit standin_exit(void)
{
	restore_all();
}

module_init(standin_init);
module_exit(standin_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("gdrprobe lab: PCI functions shown as NVIDIA GPUs");
